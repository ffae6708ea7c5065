"""Training small models from scratch: text that ships with Python, a tokenizer, the loop."""
