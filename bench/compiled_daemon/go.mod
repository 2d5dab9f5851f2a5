module sandman.dev/bench/compiled_daemon

go 1.22
