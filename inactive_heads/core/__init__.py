"""What every stage uses: the error types and atomic file writes."""
