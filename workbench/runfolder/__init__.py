"""The run folder: the contract between the ranks that write it and everyone who reads it.

`layout` names every path in it and creates one; `writer` appends the JSON-lines records a rank
writes, `reader` tails them back; `records` is the one rule for what a line must hold; `rankstate`
the rank states and the liveness rule; `events` the event kinds and their fold; `failures` how a
failure is written and worded; `private` the file modes; `provenance` where a run came from;
`stragglers` the straggler rule.  Nothing here imports the engine, the launchers, the results or
the widgets."""
