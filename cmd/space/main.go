// Command space is the space CLI and server (`space serve`); everything lives
// in internal/cli.
package main

import (
	"os"

	"github.com/spacesandbox/space/internal/cli"
)

func main() {
	os.Exit(cli.Run(os.Args[1:]))
}
