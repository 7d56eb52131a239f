"""``python -m trainflow.cli``: the ``trainflow`` command."""

from trainflow.cli.main import main

if __name__ == "__main__":
    main()
