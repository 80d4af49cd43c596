from kernelfleet.cli import main

main()
