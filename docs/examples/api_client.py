from engram_api import InvalidInputError, MemoryClient, Settings

client = MemoryClient(settings=Settings())  # Settings(neo4j_uri=...) overrides the environment
try:
    client.enqueue("../alice", "hello")
except InvalidInputError as err:
    print(err.field, "-", err.problem)  # user_id - ...; nothing was enqueued

result = client.recall("alice", "where does the user live?")
for item in result.items:
    print(item.id, item.statement)
if result.items:  # tell Engram which memories helped: it learns its scoring weights from this
    client.feedback("alice", result.recall_id, useful_ids=[result.items[0].id])
