"""What a run prints and writes for people: the markdown report and plots, the config listing, the summary table."""
