from toolkeeper.scripted.server import main

main()
