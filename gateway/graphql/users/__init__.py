"""Users and API tokens in the API: ``users``/``user``/``tokens`` queries; createUser, updateUser, deactivateUser,
reactivateUser, issueToken and revokeToken mutations."""
