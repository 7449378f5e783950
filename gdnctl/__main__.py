from gdnctl.cli import main

main()
