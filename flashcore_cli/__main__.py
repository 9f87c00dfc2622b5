from flashcore_cli.entry import main

main()
