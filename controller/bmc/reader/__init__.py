"""The controller's periodic BMC reads, done by reader processes (``--bmc-readers``).

A BMC read costs most of a millisecond of CPU in sushy, requests, urllib3
and http.client (or pyghmi), on threads that share the controller's one
interpreter with its agents and its API. The power sync reads every BMC
each interval and the leak watcher every BMC with detectors, so at fleet
size those reads alone take a large share of the controller's core. With
``--bmc-readers N`` they are done by N child processes (``worker.py``),
each with its own BMC pool (threads, per-BMC guards and breakers): the
controller sends the targets over a socket pair (``controller.link``,
frames in ``wire.py``) and gets plain values back. ``readers.py`` starts
the processes, keeps them running and shards the nodes over them;
``gateway.py`` is the ``BmcGateway`` that sends the power sync's, the leak
watcher's and the thermal poll's reads to them and everything else (power
changes, boot, media, BIOS, firmware, any call an operator makes) to the
controller's own pool. While no reader is up, the reads are done in the
controller as without readers.
"""
