from engram_api import Settings
from engram_api.cells import CellClient

# Cell 0 is this stack, from the environment (REDIS_URL, NEO4J_URI, ENGRAM_DATA_DIR); cell 1 another one.
cell_1 = Settings(redis_url="redis://redis-1:6379/0", neo4j_uri="bolt://neo4j-1:7687", data_dir="/var/engram/1")
memory = CellClient([Settings(), cell_1])
user = "shop.alice"  # SHA-256 of the id modulo 2 is 0: this user is cell 0's
receipt = memory.enqueue(user, "I just moved to Austin")  # queued in cell 0's Redis only
memory.wait(receipt)
print(memory.cell_of(user), memory.recall(user, "where does the user live?").items[:1])
memory.close()  # cell 1 was never opened: a cell's client is created on its first call
