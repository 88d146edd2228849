from engram_api import MemoryClient

client = MemoryClient()
client.wait(client.enqueue("alice", "My brother Alex works at Amazon"))
for item in client.recall("alice", "what company does my brother work for?").items:
    print(item.score, item.path, item.statement)
