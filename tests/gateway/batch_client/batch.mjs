// Sends one batch of operations with npm graphql-request's batchRequests and prints what the client made of the
// answer as one JSON line: {"results": [...]} (each operation's data) or {"error": {...}} (a ClientError).
//
//   echo '[{"document": "{ viewer { id } }"}]' | node tests/gateway/batch_client/batch.mjs URL TOKEN
//
// Dependencies are installed by ops/install (npm ci, when package-lock.json changes).
import { batchRequests, ClientError } from 'graphql-request';

const [url, token] = process.argv.slice(2);
if (!url) {
  console.error('usage: node batch.mjs <graphql url> [token] < documents.json');
  process.exit(2);
}
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const documents = JSON.parse(Buffer.concat(chunks).toString());
const headers = token ? { authorization: `Bearer ${token}` } : {};
try {
  const results = await batchRequests(url, documents, headers);
  console.log(JSON.stringify({ results }));
} catch (error) {
  if (!(error instanceof ClientError)) throw error;
  console.log(JSON.stringify({ error: { status: error.response.status, response: error.response } }));
}
