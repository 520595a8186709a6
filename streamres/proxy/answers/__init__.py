"""What the proxy keeps of answers: held while they run and read, shared between replicas,
stored (the Responses API's responses) and followed on as conversations."""
