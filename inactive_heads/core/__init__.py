"""What every stage uses: the error types, atomic file writes and the results folders' lock."""
