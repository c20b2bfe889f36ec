"""Feature verdicts: the users' porting protocol as data (configs/features.yaml), each candidate judged against the
baseline configuration with statistics, and the review file the users keep per feature (docs/porting/)."""
