package cli

import (
	"context"
	"fmt"

	sdkmcp "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/spacesandbox/space/internal/mcp"
	space "github.com/spacesandbox/space/sdk/go"
)

// mcpCommand serves space's MCP tools over stdio (for a local agent that
// starts its MCP servers as subprocesses), calling the server the other
// verbs talk to with their URL and key.
func (a *app) mcpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve space's MCP tools over stdio (for agents that run MCP servers as subprocesses)",
		Long: "mcp runs a Model Context Protocol server on stdin/stdout whose tools (sandbox_create, command_run, code_run, file_read, …)\n" +
			"call the space server given by --url/SPACE_URL with the key in --api-key/SPACE_API_KEY. `space serve` answers the same\n" +
			"tools over HTTP at /mcp. See docs/MCP.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			// A wrong URL or key is said at once on stderr (what an agent
			// logs of its MCP servers); the server runs anyway, so an
			// agent started before the space server still gets its
			// tools once that server is up.
			if _, err := c.ListSandboxes(cmd.Context(), space.ListOptions{Limit: 1}); err != nil {
				fmt.Fprintf(a.stderr, "space mcp: warning: %s: %s\n", c.BaseURL(), a.explain(err))
			}
			srv := mcp.New(func(context.Context, *sdkmcp.RequestExtra) (*space.Client, error) { return c, nil }, version())
			return srv.Run(cmd.Context(), &sdkmcp.StdioTransport{})
		},
	}
}
