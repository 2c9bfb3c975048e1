"""The actor process and everything it runs: env sampling, n-step windows, exploration, its id."""
