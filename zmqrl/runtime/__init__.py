"""What every role process runs besides its work: the supervisor link, watchdog, health file,
guarded threads and the faults tests inject."""
