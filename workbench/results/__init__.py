"""What is read after or beside a run, in the notebook or the shell: run history and comparison
(`history`), exports (`exporters`), the step-time report (`analysis`), figures (`plots`) and the
metric views they draw (`metricview`)."""
