// Command space-agent is the guest agent that runs inside every sandbox.
// See package internal/agent.
package main

import (
	"os"

	"github.com/spacesandbox/space/internal/agent"
)

func main() { os.Exit(agent.Run(os.Args)) }
