"""The answer: one answer's state machine, above the providers and the fleet (pure).

``states`` is the table — state × event → next state — and its theory of operation; ``machine``
(``Answer``) takes the shell's facts, moves by the table and runs the steps; ``actions`` is what
it asks of its shell. The rooms its steps work with, each owning its changes: ``chain`` (the
models in order and each one's record), ``attempt`` (the attempt in progress and its exchange),
``delivery`` (what reached the caller, and its books), ``seam`` (a continuation that did not
continue), ``reattach`` (a response the server kept generating), ``memory`` (what the process
learnt of servers), ``counting`` (the token encodings), ``reading`` (a response's reads),
``request`` (the next request), ``choice`` (which model), ``waits`` (how long an attempt
waits, and how slow it may go), ``telling`` (what the caller is told);
``options`` is one answer's checked arguments.
"""
