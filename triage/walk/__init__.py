"""The walk (a floor of DESIGN §6): the playbook's flowchart and the engine that walks it, running each
node's experiment from the restored snapshot and branching on the outcomes. It may import the
foundations (triage/*.py), loading (triage.load) and the experiments; nothing above it (the report,
the command line).

    playbook/    the YAML schema, graph validation, the condition language
    engine.py    walks the graph (Walker); differential.py: a differential node's candidates and winner
    measuring.py an experiment run from the snapshot and judged; the speed machinery (Measurer): the same
                 figures reused, racing, forked.py's candidates two at a time
    stops.py     a walk that ends before a leaf; listener.py: what the terminal hears; reads.py: who reads what
    settle.py    the end of each experiment on every rank; reduce.py: every rank's outcome reduced to one
"""
