from ladder._cli.main import main

main()
