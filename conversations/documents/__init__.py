"""Documents in the chat: uploads, text extraction, chunks, retrieval and embeddings."""
