"""gmlp-serve against other serving frameworks: one small server per peer, wrk, /proc CPU."""
