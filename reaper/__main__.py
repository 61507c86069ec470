from reaper.cli import run

run()
