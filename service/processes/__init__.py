"""A server of several processes: one engine that holds the models, front-ends that hold the sockets.

`topology` says who a process is, `wire` how the two kinds talk (Unix socket, shared memory),
`engine` and `front` each side (docs/service.md, "Processes")."""
