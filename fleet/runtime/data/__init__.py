"""The data plane: preprocessors, shared streams, chunks, bounded queues and shared memory."""
