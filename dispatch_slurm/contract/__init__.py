"""The contract: pure functions of their inputs, no I/O.

``epoch`` (G, N, R), ``names`` (publication, submission and attempt names), ``layout``
(every entry under a root), ``env`` (the DISPATCH_* values of an execution), ``siteconf``
(the site's settings). The C plugin implements the same rules; tests/vectors/ holds the
cases both must reproduce."""
