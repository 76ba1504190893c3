"""evokube operator: turns ERLExperiment resources into trainer Jobs."""
