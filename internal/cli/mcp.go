package cli

import (
	"context"

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
			srv := mcp.New(func(context.Context, *sdkmcp.RequestExtra) (*space.Client, error) { return c, nil }, version())
			return srv.Run(cmd.Context(), &sdkmcp.StdioTransport{})
		},
	}
}
