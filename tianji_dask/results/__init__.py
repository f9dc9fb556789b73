"""What a run writes and reads back: its directory, the metrics and episodes it records, its
checkpoints, continuing it, and the analysis of many runs."""
