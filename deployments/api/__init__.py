"""The API surface of the public front: OpenAI request schemas and ``APIError``, the engine-reaching
APIs (apis), bounded body reading (bodies), what a request's headers say (request_headers), API keys
(api_keys), and the Responses API with its Redis store (responses_api, response_store).
"""
