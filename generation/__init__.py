"""Generation engines behind one small protocol, and the event batching of their streams.

Plain asyncio, no Ray: the generator deployments wrap these, the overhead benchmark drives
the paced engine directly, and tests run them in-process.
"""
