// The official MCP TypeScript SDK client against space's /mcp: lists the
// tools, creates a sandbox, runs a command in it, reads the command's
// output resource and kills the sandbox; prints what it saw as JSON.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = process.env.SPACE_URL;
const key = process.env.SPACE_API_KEY;
const transport = new StreamableHTTPClientTransport(new URL(url + "/mcp"), {
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
});
const client = new Client({ name: "space-e2e-ts", version: "1.0.0" });
await client.connect(transport);

const { tools } = await client.listTools();
const created = await client.callTool({ name: "sandbox_create", arguments: {} });
if (created.isError) throw new Error("sandbox_create: " + created.content[0].text);
const sb = JSON.parse(created.content[0].text);
const ran = await client.callTool({ name: "command_run", arguments: { sandbox_id: sb.id, command: "echo from typescript; uname -s" } });
const run = JSON.parse(ran.content[0].text);
const output = await client.readResource({ uri: run.output_uri });
const bad = await client.callTool({ name: "command_run", arguments: { sandbox_id: sb.id } });
await client.callTool({ name: "sandbox_kill", arguments: { sandbox_id: sb.id } });
console.log(JSON.stringify({
  tools: tools.map((t) => t.name),
  run,
  resource: output.contents[0].text,
  badIsError: bad.isError === true,
  badText: bad.content[0]?.text ?? "",
}));
await client.close();
