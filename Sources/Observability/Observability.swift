// The Observability layer is not built yet; this module is a placeholder so the product exists.
// See Docs/Architecture.md for what it will hold and the open issue that delivers it.
