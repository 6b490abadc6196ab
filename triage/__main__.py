from triage.cli.commands import main

main()
