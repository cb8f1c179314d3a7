"""What the daemon tells operators: the JSON-lines events stream next to the human log."""
