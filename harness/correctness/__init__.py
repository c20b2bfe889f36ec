"""Level 2: teacher-forced scorings, greedy streams, perplexity, chat and task goldens, and the rules that compare them."""
