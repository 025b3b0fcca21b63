"""What is drawn and reported from a run's data, in the notebook or the shell: exports (`exporters`),
the step-time report (`analysis`), figures (`plots`) and the metric views they draw (`metricview`,
`series`, `panels`, `m4`).  This layer sits below `launch/` and imports nothing of it at run time: it
works on the reader's frames and paths (the exporters are handed a `Run` and call only its reading
methods).  Run history and comparison, which build `Run` handles, are `workbench.launch.history`."""
