from kernelwright.cli import main

main()
