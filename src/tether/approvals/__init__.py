"""The human side of a suspension: the request and its checks, the claim and the
resumption, the preview of an edit, what the inbox lists."""
