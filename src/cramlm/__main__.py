from cramlm.cli import main

main()
