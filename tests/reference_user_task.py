"""The outcomes of the user task (tests/integration/user_task.py) computed without the toolkit: the
prompt written out by hand (the description, the first train example with its answer, the question;
each answer " " + option), the Hugging Face tokenizer, and the plain Hugging Face model's forward
pass (eager attention, float32), one input at a time. Used by the evaluate, local-sweep and Ray tests."""

import torch

PROMPT_HEAD = "Capitals of countries.\n\nQ: What is the capital of Japan?\nA: Tokyo\n\n"


def tiny_llama_dir(directory) -> str:
    """A tiny random-weight Llama saved with the SmolLM2 tokenizer (loadable by path, also by Ray workers)."""
    from tiny import save_tiny_llama_with_smollm2_tokenizer

    return save_tiny_llama_with_smollm2_tokenizer(directory)


def outcomes_by_hand(model_dir: str, docs: list[dict]) -> tuple[list[bool], list[bool]]:
    """(correct, correct_norm) per question: the option with the largest log-likelihood (divided by its
    length in characters for acc_norm) is the gold one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    correct, correct_norm = [], []
    for doc in docs:
        context = PROMPT_HEAD + f"Q: What is the capital of {doc['country']}?\nA:"
        ctx = tok.encode(context, add_special_tokens=False)
        lls = []
        for option in doc["options"]:
            whole = tok.encode(context + " " + option, add_special_tokens=False)
            cont = whole[len(ctx):]
            with torch.no_grad():
                logprobs = torch.log_softmax(hf(torch.tensor([whole[:-1]])).logits[0].double(), dim=-1)
            lls.append(sum(logprobs[len(ctx) - 1 + k, t].item() for k, t in enumerate(cont)))
        norm = [ll / len(option) for ll, option in zip(lls, doc["options"])]
        n = len(lls)
        correct.append(max(range(n), key=lls.__getitem__) == doc["answer"])
        correct_norm.append(max(range(n), key=norm.__getitem__) == doc["answer"])
    return correct, correct_norm
