"""What several test folders share: tiny model configs and fixture paths (`helpers`), real servers
started and waited on (`servers`, `repository_servers`), raw sockets (`raw_http`), a test
certificate authority (`certs`), keys files (`keys`), broken repository directories
(`broken_dirs`) and the top-k test models (`top_k_models`). Product code never imports it, and
no test imports `benchmarks/`."""
