"""The answer: one answer's state machine, above the providers and the fleet (pure).

``states`` is the table of what may follow what; ``machine`` applies it; ``attempt``,
``delivery`` and ``request`` hold the attempt in progress, what reached the caller (and its
count), and how the next request is built; ``actions`` and ``memory`` are what the machine asks
of its shell and what it is given; ``options`` is one answer's checked arguments.
"""
