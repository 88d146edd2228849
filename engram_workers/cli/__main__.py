"""``python -m engram_workers.cli``: how ``engram up`` and ``engram demo`` start Beat and Flower children."""

from engram_workers.cli import main

if __name__ == "__main__":
    main()
