"""The plain-text table renderer the CLI and the text report share (expected output typed by hand)."""

from inactive_heads.core.text import text_table


def test_numbers_right_words_left_by_default():
    table = text_table(["key", "mean"], [["awft", 0.5], ["ahon_ln", 12.25]])
    assert table == (
        "key       mean\n"
        "-------  -----\n"
        "awft       0.5\n"
        "ahon_ln  12.25"
    )


def test_explicit_left_columns_and_trailing_spaces_cut():
    table = text_table(["rank", "score", "AUC"], [["1", "AHON (LN)", "0.9 [0.8, 1.0]"], ["10", "AWFT", "—"]],
                       left={1})
    assert table == (
        "rank  score                 AUC\n"
        "----  ---------  --------------\n"
        "   1  AHON (LN)  0.9 [0.8, 1.0]\n"
        "  10  AWFT                    —"
    )


def test_header_only_is_left_aligned():
    assert text_table(["a", "bb"], []) == "a  bb\n-  --"
