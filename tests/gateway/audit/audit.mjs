// Runs every audit of graphql-http's serverAudits (the GraphQL-over-HTTP spec's reference suite)
// against a running server and prints the results as one JSON array on stdout.
//
//   node tests/gateway/audit/audit.mjs http://127.0.0.1:8420/graphql
//
// Dependencies are installed by ops/install (npm ci, when package-lock.json changes).
import { serverAudits } from 'graphql-http';

const url = process.argv[2];
if (!url) {
  console.error('usage: node audit.mjs <graphql url>');
  process.exit(2);
}

const results = [];
for (const audit of serverAudits({ url, fetchFn: fetch })) {
  const result = await audit.fn();
  const { id, name, status, reason, response } = result;
  results.push(status === 'ok' ? { id, name, status } : {
    id, name, status, reason,
    responseStatus: response?.status,
    responseType: response?.headers.get('content-type'),
    responseBody: response && !response.bodyUsed ? await response.text() : undefined,
  });
}
console.log(JSON.stringify(results));
