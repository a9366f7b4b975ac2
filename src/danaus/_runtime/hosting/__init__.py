"""Host and process management: the host agent, the zygote, spawned procs' main
function, worker hosts and CPU binding."""
