"""``python -m zmqrl ...``: the same CLI as the ``zmqrl`` console script."""

from zmqrl.cli.app import main

if __name__ == "__main__":
    main()
