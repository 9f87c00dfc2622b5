from flashcore_cli.cli import main

main()
