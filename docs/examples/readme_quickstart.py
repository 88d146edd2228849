from engram_api import MemoryClient

client = MemoryClient()  # reads NEO4J_URI, REDIS_URL, LLM_MODEL, ... from the environment
receipt = client.enqueue("alice", "I just moved from Tampa to Austin")  # returns at once
client.wait(receipt)  # only demos and tests wait
result = client.recall("alice", "where does the user live?")  # facts and dated conversation excerpts
print([(i.kind, i.statement, i.event_time) for i in result.items])
print(client.get_context("alice", "where does the user live?", max_tokens=300))
