"""OpenAI's Files and Batch API: the routes (batch_api), files and batches in Redis (batch_store),
and the runner that spends spare capacity on batch lines (batch_runner).
"""
