"""What turns the library into experiments: configs, the experiment registry, claims, demo."""
